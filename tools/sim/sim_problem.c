/* sim_problem.c - the built-in training problem (sim_problem.h): a
 * 2-layer MLP fine-tuned towards a nearby teacher, with Adam. Loops are
 * written so their inner dimension is a contiguous row (axpy form), which
 * compilers vectorize without reassociating sums (tools/CMakeLists.txt
 * builds this file with -O3). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pulse_elem.h"
#include "rng_impl.h"
#include "sim_mlp_impl.h"
#include "sim_pretrain.h"
#include "sim_problem.h"
#include "sim_rl.h"
#include "sim_text.h"
#include "status_impl.h"

struct pulse_sim_problem {
  pulse_sim_problem_opts o;
  uint64_t P;
  uint64_t w1, b1, w2,
      b2;           /* offsets: W1[in][hid], b1[hid], W2[hid][cls], b2[cls] */
  float s1, s2;     /* forward multipliers 1/sqrt(fan-in) */
  float *teacher;   /* B, P floats */
  float *test_x;    /* test_count x inputs */
  float *test_p;    /* test_count x classes: B's probabilities */
  uint32_t *test_y; /* B's argmax */
  double floor;
  pulse_sim_text *text; /* the text problems: the rest is unused */
  float *pretrained;    /* text SFT and RL: the checkpoint, P floats */
  double pretrain_loss; /* its held-out loss */
};

struct pulse_sim_learner {
  const pulse_sim_problem *p;
  uint64_t rng;
  uint64_t t; /* Adam steps taken */
  float *m, *v, *grad;
  float *at; /* PULSE_SIM_COMPUTE_BF16: bf16(theta), what it computes with */
  float *x, *z, *h, *logits, *dz, *tp;
  pulse_sim_text_scratch *ts; /* text problem */
  pulse_sim_rl_scratch *rs;   /* text RL */
};

/* The loops that take the time, also built for AVX2 and picked at load time:
 * IEEE single operations in any vector width give the same bits
 * (-ffp-contract=off forbids fused multiply-adds), so results do not depend
 * on the machine. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PROBLEM_SIMD __attribute__((target_clones("avx2", "default")))
#else
#define PROBLEM_SIMD
#endif

static void forward(const pulse_sim_problem *p, const float *theta,
                    const float *x, size_t n, float *z, float *h,
                    float *logits);

/* ------------------------------------------------------------- precision */

/* out[i] = bf16(in[i]) as FP32: the project's one rounding (round to
 * nearest even, pulse_elem.h), on bits, so it is the same on every
 * machine. */
static void round_to_bf16(const float *in, float *out, uint64_t n) {
  for (uint64_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &in[i], sizeof u);
    u = pulse_f32_bits_from_bf16(pulse_bf16_from_f32_bits(u));
    memcpy(&out[i], &u, sizeof u);
  }
}

/* The weights a problem computes with: theta itself (FP32), or its BF16
 * rounding in *owned (freed by the caller; NULL when out of memory). */
static const float *compute_weights(const pulse_sim_problem *p,
                                    const float *theta, float **owned) {
  *owned = NULL;
  if (p->o.compute != PULSE_SIM_COMPUTE_BF16)
    return theta;
  *owned = malloc((size_t)p->P * sizeof **owned);
  if (*owned != NULL)
    round_to_bf16(theta, *owned, p->P);
  return *owned;
}

/* ------------------------------------------------------------ generators */

/* Softmax of one row of logits in place; returns log(sum exp(l - max)) and
 * the max, so that -log p[c] = lse - (l[c] - max). */
static double softmax_row(float *l, uint32_t cls, float *mx_out,
                          uint32_t *argmax) {
  float mx = l[0];
  uint32_t am = 0;
  for (uint32_t c = 1; c < cls; c++)
    if (l[c] > mx)
      mx = l[c], am = c;
  double sum = 0.0;
  for (uint32_t c = 0; c < cls; c++)
    sum += exp((double)(l[c] - mx));
  for (uint32_t c = 0; c < cls; c++)
    l[c] = (float)(exp((double)(l[c] - mx)) / sum);
  if (mx_out)
    *mx_out = mx;
  if (argmax)
    *argmax = am;
  return log(sum);
}

/* n inputs and the teacher's probabilities for them (n x classes in tp);
 * z and h are scratch for the teacher's hidden layer. */
static void draw(const pulse_sim_problem *p, uint64_t *s, size_t n, float *x,
                 float *tp, float *z, float *h) {
  uint32_t cls = p->o.classes;
  pulse_sim_normals(s, x, n * p->o.inputs);
  forward(p, p->teacher, x, n, z, h, tp);
  for (size_t b = 0; b < n; b++)
    softmax_row(tp + b * cls, cls, NULL, NULL);
}

/* -------------------------------------------------------------- problem */

uint32_t pulse_sim_problem_hidden_for(const pulse_sim_problem_opts *o,
                                     uint64_t params) {
  if (pulse_sim_problem_is_text(o->kind))
    return pulse_sim_text_hidden_for(o, params);
  uint64_t per = (uint64_t)o->inputs + 1u + o->classes;
  uint64_t h = params > o->classes ? (params - o->classes) / per : 1;
  return h < 1 ? 1u : h > 1u << 24 ? 1u << 24 : (uint32_t)h;
}

void pulse_sim_problem_opts_init(pulse_sim_problem_opts *o) {
  memset(o, 0, sizeof *o);
  o->struct_version = PULSE_SIM_PROBLEM_OPTS_VERSION;
  o->seed = 1;
  o->inputs = 128;
  o->hidden = 512;
  o->classes = 10;
  o->batch = 32;
  o->test_count = 1024;
  o->init_scale = 1.0f;
  o->shift = 0.02f;
  o->logit_scale = 30.0f;
  o->lr = 2e-5f;
  o->beta1 = 0.9f;
  o->beta2 = 0.99f;
  o->eps = 1e-8f;
  o->kind = PULSE_SIM_PROBLEM_TEACHER;
  o->context = 8;
  o->embed = 64;
  o->pretrain_steps = 3000;
  o->pretrain_lr = PULSE_SIM_TEXT_LR;
  o->rl_group = PULSE_SIM_TEXT_RL_GROUP;
  o->rl_length = PULSE_SIM_TEXT_RL_LENGTH;
}

/* Text SFT and RL: the checkpoint the learners start from. The model is
 * trained from its random start (pulse_sim_text_init) by one supervised
 * learner of its own stream at pretrain_lr on the pretraining blocks, or
 * read from the cache (sim_pretrain.h: the key leaves the kind out, so
 * both read one file); then the text's learners move to the fine-tuning
 * blocks. */
static pulse_status pretrain(pulse_sim_problem *p) {
  size_t P = (size_t)p->P;
  p->pretrained = malloc(P * sizeof *p->pretrained);
  if (p->pretrained == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "pretraining: %zu parameters", P);
  uint64_t key =
      pulse_sim_pretrain_key(&p->o, p->P, pulse_sim_text_digest(p->text));
  if (!pulse_sim_pretrain_load(key, p->P, p->pretrained, &p->pretrain_loss)) {
    pulse_sim_text_set_phase(p->text, 0);
    pulse_sim_text_init(p->text, p->pretrained);
    /* A learner of the pretraining's rate, over this problem's text. */
    pulse_sim_problem pre = *p;
    pre.o.lr = p->o.pretrain_lr;
    pre.o.kind = PULSE_SIM_PROBLEM_TEXT_SFT; /* supervised, for RL too */
    pre.o.compute = PULSE_SIM_COMPUTE_FP32;  /* one checkpoint for all */
    pre.pretrained = NULL;
    pulse_sim_learner *l = NULL;
    pulse_status st = pulse_sim_learner_create(&pre, UINT32_MAX - 1u, &l);
    if (st != PULSE_OK)
      return st;
    for (uint32_t s = 0; s < p->o.pretrain_steps; s++)
      pulse_sim_learner_step(l, p->pretrained);
    pulse_sim_learner_free(l);
    pulse_sim_text_eval(p->text, p->pretrained, &p->pretrain_loss, NULL);
    pulse_sim_pretrain_save(key, p->P, p->pretrained, p->pretrain_loss);
  }
  pulse_sim_text_set_phase(p->text, 1);
  return PULSE_OK;
}

pulse_status pulse_sim_problem_create(const pulse_sim_problem_opts *o,
                                     pulse_sim_problem **out) {
  if (out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "loco problem: NULL output");
  *out = NULL;
  if (o == NULL || o->struct_version != PULSE_SIM_PROBLEM_OPTS_VERSION)
    return pulse_fail(PULSE_ERR_ARG,
                      "loco problem: options missing or of another version");
  if (o->inputs == 0 || o->hidden == 0 || o->classes < 2 || o->batch == 0 ||
      o->test_count == 0 || o->inputs > 1u << 16 || o->hidden > 1u << 24 ||
      o->classes > 1u << 16 || o->batch > 1u << 16 ||
      o->test_count > 1u << 24 || !(o->lr > 0.0f) || !isfinite(o->shift) ||
      !isfinite(o->init_scale) || !isfinite(o->logit_scale))
    return pulse_fail(PULSE_ERR_ARG, "loco problem: bad sizes or rates");
  if (o->compute != PULSE_SIM_COMPUTE_FP32 &&
      o->compute != PULSE_SIM_COMPUTE_BF16)
    return pulse_fail(PULSE_ERR_ARG,
                      "loco problem: compute %u is neither FP32 (0) nor "
                      "BF16 (1)",
                      o->compute);
  if (o->parametrization != PULSE_SIM_PARAM_SCALED &&
      (o->parametrization != PULSE_SIM_PARAM_STANDARD ||
       !pulse_sim_problem_is_text(o->kind)))
    return pulse_fail(PULSE_ERR_ARG,
                      "loco problem: parametrization %u: scaled (0), or "
                      "standard (1) for the text problems",
                      o->parametrization);
  if (o->kind != PULSE_SIM_PROBLEM_TEACHER && !pulse_sim_problem_is_text(o->kind))
    return pulse_fail(PULSE_ERR_ARG, "loco problem: unknown kind %u", o->kind);
  if (pulse_sim_problem_is_pretrained(o->kind) &&
      (o->pretrain_steps == 0 || !(o->pretrain_lr > 0.0f)))
    return pulse_fail(PULSE_ERR_ARG, "loco problem: text SFT and RL need "
                      "pretraining steps and a rate");
  pulse_sim_problem *p = calloc(1, sizeof *p);
  if (p == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "loco problem");
  p->o = *o;
  if (pulse_sim_problem_is_text(o->kind)) {
    pulse_status st = pulse_sim_text_create(o, &p->text);
    if (st != PULSE_OK) {
      free(p);
      return st;
    }
    p->P = pulse_sim_text_param_count(p->text);
    if (pulse_sim_problem_is_pretrained(o->kind) &&
        (st = pretrain(p)) != PULSE_OK) {
      pulse_sim_problem_free(p);
      return st;
    }
    /* Pretrained as the cache holds it (scaled, FP32), then converted. */
    if (o->parametrization == PULSE_SIM_PARAM_STANDARD)
      pulse_sim_text_unfold(p->text, p->pretrained);
    /* The cache holds the loss of the scaled FP32 model; the learners
     * start from the loss of what they compute with. */
    if (p->pretrained != NULL && (o->compute != PULSE_SIM_COMPUTE_FP32 ||
                                  o->parametrization != PULSE_SIM_PARAM_SCALED))
      pulse_sim_problem_eval(p, p->pretrained, &p->pretrain_loss, NULL);
    *out = p;
    return PULSE_OK;
  }
  uint64_t in = o->inputs, hid = o->hidden, cls = o->classes;
  p->w1 = 0;
  p->b1 = in * hid;
  p->w2 = p->b1 + hid;
  p->b2 = p->w2 + hid * cls;
  p->P = p->b2 + cls;
  p->s1 = 1.0f / sqrtf((float)in);
  p->s2 = 1.0f / sqrtf((float)hid);
  size_t T = o->test_count;
  p->teacher = malloc((size_t)p->P * sizeof *p->teacher);
  p->test_x = malloc(T * in * sizeof *p->test_x);
  p->test_p = malloc(T * cls * sizeof *p->test_p);
  p->test_y = malloc(T * sizeof *p->test_y);
  float *z = malloc(T * hid * sizeof *z), *h = malloc(T * hid * sizeof *h);
  if (!p->teacher || !p->test_x || !p->test_p || !p->test_y || !z || !h) {
    free(z), free(h);
    pulse_sim_problem_free(p);
    return pulse_fail(PULSE_ERR_NOMEM, "loco problem: data");
  }
  /* The teacher: the pretrained weights plus offsets of std `shift`. */
  pulse_sim_problem_init(p, p->teacher);
  float *off = malloc((size_t)p->P * sizeof *off);
  if (off == NULL) {
    free(z), free(h);
    pulse_sim_problem_free(p);
    return pulse_fail(PULSE_ERR_NOMEM, "loco problem: teacher");
  }
  uint64_t s = o->seed ^ 0x7EAC4E5ull;
  pulse_sim_normals(&s, off, (size_t)p->P);
  for (uint64_t i = 0; i < p->P; i++)
    p->teacher[i] += o->shift * off[i];
  free(off);
  uint64_t t = o->seed ^ 0x7E57DA7Aull;
  pulse_sim_normals(&t, p->test_x, T * in);
  forward(p, p->teacher, p->test_x, T, z, h, p->test_p);
  double ent = 0.0;
  for (size_t b = 0; b < T; b++) {
    float *row = p->test_p + b * cls, mx;
    double lse = softmax_row(row, cls, &mx, &p->test_y[b]);
    (void)lse;
    for (uint32_t c = 0; c < cls; c++)
      if (row[c] > 0.0f)
        ent -= (double)row[c] * log((double)row[c]);
  }
  p->floor = ent / (double)T;
  free(z), free(h);
  *out = p;
  return PULSE_OK;
}

void pulse_sim_problem_free(pulse_sim_problem *p) {
  if (p == NULL)
    return;
  free(p->teacher), free(p->test_x), free(p->test_p), free(p->test_y);
  free(p->pretrained);
  pulse_sim_text_free(p->text);
  free(p);
}

uint64_t pulse_sim_problem_param_count(const pulse_sim_problem *p) {
  return p->P;
}

double pulse_sim_problem_floor(const pulse_sim_problem *p) {
  return p->floor;
}

double pulse_sim_problem_lr(const pulse_sim_problem *p) { return p->o.lr; }

double pulse_sim_problem_pretrain_loss(const pulse_sim_problem *p) {
  return p->pretrained ? p->pretrain_loss : 0.0;
}

uint32_t pulse_sim_problem_pretrain_steps(const pulse_sim_problem *p) {
  return p->pretrained ? p->o.pretrain_steps : 0;
}

uint32_t pulse_sim_problem_batch(const pulse_sim_problem *p) {
  return p->o.batch;
}

void pulse_sim_problem_data(const pulse_sim_problem *p, uint64_t *bytes,
                           uint64_t *digest) {
  *bytes = p->text ? pulse_sim_text_bytes(p->text) : 0;
  *digest = p->text ? pulse_sim_text_digest(p->text) : 0;
}

void pulse_sim_problem_init(const pulse_sim_problem *p, float *theta) {
  if (p->pretrained) {
    memcpy(theta, p->pretrained, (size_t)p->P * sizeof *theta);
    return;
  }
  if (p->text) {
    pulse_sim_text_init(p->text, theta);
    return;
  }
  uint64_t s = p->o.seed ^ 0x1417ull;
  pulse_sim_normals(&s, theta, (size_t)p->b1);
  pulse_sim_normals(&s, theta + p->w2, (size_t)(p->b2 - p->w2));
  for (uint64_t i = 0; i < p->P; i++)
    theta[i] *= p->o.init_scale;
  memset(theta + p->b1, 0, p->o.hidden * sizeof *theta);
  memset(theta + p->b2, 0, p->o.classes * sizeof *theta);
}

/* Forward pass of n samples: z (pre-activations), h (ReLU) and logits. */
PROBLEM_SIMD static void forward(const pulse_sim_problem *p, const float *theta,
                                 const float *x, size_t n, float *z, float *h,
                                 float *logits) {
  uint32_t in = p->o.inputs, hid = p->o.hidden, cls = p->o.classes;
  const float *W1 = theta + p->w1, *B1 = theta + p->b1, *W2 = theta + p->w2,
              *B2 = theta + p->b2;
  for (size_t b = 0; b < n; b++) {
    float *lb = logits + b * cls;
    pulse_sim_mlp_forward_row(x + b * in, in, p->s1, W1, B1, hid, p->s2, W2, B2, cls,
                             z + b * hid, h + b * hid, lb);
    for (uint32_t c = 0; c < cls; c++)
      lb[c] *= p->o.logit_scale;
  }
}

double pulse_sim_problem_reward(const pulse_sim_problem *p,
                               const float *theta) {
  if (p->o.kind != PULSE_SIM_PROBLEM_TEXT_RL)
    return 0.0;
  float *owned;
  const float *at = compute_weights(p, theta, &owned);
  double r = at != NULL ? pulse_sim_rl_eval(p->text, at) : NAN;
  free(owned);
  return r;
}

static void eval_at(const pulse_sim_problem *p, const float *theta,
                    double *loss, double *accuracy);

void pulse_sim_problem_eval(const pulse_sim_problem *p, const float *theta,
                           double *loss, double *accuracy) {
  float *owned;
  const float *at = compute_weights(p, theta, &owned);
  if (at != NULL) {
    eval_at(p, at, loss, accuracy);
  } else {
    if (loss)
      *loss = NAN;
    if (accuracy)
      *accuracy = NAN;
  }
  free(owned);
}

/* Held-out loss and accuracy of the weights computed with. */
static void eval_at(const pulse_sim_problem *p, const float *theta,
                    double *loss, double *accuracy) {
  if (p->text) {
    pulse_sim_text_eval(p->text, theta, loss, accuracy);
    return;
  }
  enum { BLOCK = 64 };
  uint32_t hid = p->o.hidden, cls = p->o.classes, in = p->o.inputs;
  float *z = malloc((size_t)BLOCK * hid * sizeof *z),
        *h = malloc((size_t)BLOCK * hid * sizeof *h);
  float *l = malloc((size_t)BLOCK * cls * sizeof *l);
  double total = 0.0;
  uint64_t right = 0;
  if (z && h && l) {
    for (uint32_t a = 0; a < p->o.test_count; a += BLOCK) {
      size_t n = p->o.test_count - a < BLOCK ? p->o.test_count - a : BLOCK;
      forward(p, theta, p->test_x + (size_t)a * in, n, z, h, l);
      for (size_t b = 0; b < n; b++) {
        const float *lb = l + b * cls, *pb = p->test_p + (size_t)(a + b) * cls;
        float mx = lb[0];
        uint32_t am = 0;
        for (uint32_t c = 1; c < cls; c++)
          if (lb[c] > mx)
            mx = lb[c], am = c;
        double sum = 0.0, dot = 0.0;
        for (uint32_t c = 0; c < cls; c++) {
          sum += exp((double)(lb[c] - mx));
          dot += (double)pb[c] * (double)(lb[c] - mx);
        }
        total += log(sum) - dot; /* sum_c p_B(c) * -log p(c) */
        right += am == p->test_y[a + b];
      }
    }
  } else {
    total = NAN;
  }
  free(z), free(h), free(l);
  if (loss)
    *loss = total / p->o.test_count;
  if (accuracy)
    *accuracy = (double)right / p->o.test_count;
}

/* -------------------------------------------------------------- learner */

pulse_status pulse_sim_learner_create(const pulse_sim_problem *p,
                                     uint32_t trainer_id,
                                     pulse_sim_learner **out) {
  if (p == NULL || out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "loco learner: NULL argument");
  pulse_sim_learner *l = calloc(1, sizeof *l);
  if (l == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "loco learner");
  size_t B = p->o.batch, P = (size_t)p->P;
  l->p = p;
  l->rng = p->o.seed * 0x100000001B3ull ^
           ((uint64_t)trainer_id + 1u) * 0xD1B54A32D192ED03ull;
  l->m = calloc(P, sizeof *l->m);
  l->v = calloc(P, sizeof *l->v);
  l->grad = malloc(P * sizeof *l->grad);
  if (p->o.compute == PULSE_SIM_COMPUTE_BF16 &&
      (l->at = malloc(P * sizeof *l->at)) == NULL) {
    pulse_sim_learner_free(l);
    return pulse_fail(PULSE_ERR_NOMEM, "loco learner: %zu parameters", P);
  }
  if (p->text) { /* its own buffers */
    int rl = p->o.kind == PULSE_SIM_PROBLEM_TEXT_RL;
    uint32_t rows = rl ? p->o.rl_group * p->o.rl_length : p->o.batch;
    pulse_status st = PULSE_ERR_NOMEM;
    if (!l->m || !l->v || !l->grad ||
        (st = pulse_sim_text_scratch_create(p->text, rows, &l->ts)) !=
            PULSE_OK ||
        (rl && (st = pulse_sim_rl_scratch_create(p->text, &l->rs)) !=
                   PULSE_OK)) {
      pulse_sim_learner_free(l);
      return st == PULSE_ERR_NOMEM
                 ? pulse_fail(PULSE_ERR_NOMEM, "loco learner: %zu parameters",
                              P)
                 : st;
    }
    *out = l;
    return PULSE_OK;
  }
  l->x = malloc(B * p->o.inputs * sizeof *l->x);
  l->z = malloc(B * p->o.hidden * sizeof *l->z);
  l->h = malloc(B * p->o.hidden * sizeof *l->h);
  l->dz = malloc(B * p->o.hidden * sizeof *l->dz);
  l->logits = malloc(B * p->o.classes * sizeof *l->logits);
  l->tp = malloc(B * p->o.classes * sizeof *l->tp);
  if (!l->m || !l->v || !l->grad || !l->x || !l->z || !l->h || !l->dz ||
      !l->logits || !l->tp) {
    pulse_sim_learner_free(l);
    return pulse_fail(PULSE_ERR_NOMEM, "loco learner: %zu parameters", P);
  }
  *out = l;
  return PULSE_OK;
}

void pulse_sim_learner_free(pulse_sim_learner *l) {
  if (l == NULL)
    return;
  free(l->m), free(l->v), free(l->grad), free(l->at), free(l->x), free(l->z),
      free(l->h), free(l->dz);
  free(l->logits), free(l->tp);
  pulse_sim_text_scratch_free(l->ts);
  pulse_sim_rl_scratch_free(l->rs);
  free(l);
}

static double grad_at(pulse_sim_learner *l, const float *theta, float *grad);

double pulse_sim_learner_grad(pulse_sim_learner *l, const float *theta,
                              float *grad) {
  if (l->at == NULL) /* PULSE_SIM_COMPUTE_FP32 */
    return grad_at(l, theta, grad);
  /* Mixed precision: forward, backward (and text RL's sampling) at the
   * BF16 weights; the gradient goes to the FP32 master (Adam). */
  round_to_bf16(theta, l->at, l->p->P);
  return grad_at(l, l->at, grad);
}

/* The gradient at the weights computed with. */
PROBLEM_SIMD static double grad_at(pulse_sim_learner *l, const float *theta,
                                   float *grad) {
  const pulse_sim_problem *p = l->p;
  if (l->rs)
    return pulse_sim_rl_grad(p->text, l->ts, l->rs, &l->rng, theta, grad);
  if (p->text)
    return pulse_sim_text_grad(p->text, l->ts, &l->rng, theta, grad);
  uint32_t B = p->o.batch, in = p->o.inputs, hid = p->o.hidden,
           cls = p->o.classes;
  draw(p, &l->rng, B, l->x, l->tp, l->z, l->h);
  forward(p, theta, l->x, B, l->z, l->h, l->logits);
  memset(grad, 0, (size_t)p->P * sizeof *grad);
  float *gW1 = grad + p->w1, *gB1 = grad + p->b1, *gW2 = grad + p->w2,
        *gB2 = grad + p->b2;
  const float *W2 = theta + p->w2;
  double loss = 0.0;
  float invB = 1.0f / (float)B;
  for (uint32_t b = 0; b < B; b++) {
    float *lb = l->logits + (size_t)b * cls; /* becomes dL/dlogits */
    const float *tb = l->tp + (size_t)b * cls;
    float mx;
    double dot = 0.0;
    for (uint32_t c = 0; c < cls; c++)
      dot += (double)tb[c] * (double)lb[c];
    double lse = softmax_row(lb, cls, &mx, NULL);
    loss += lse + (double)mx - dot; /* sum_c p_B(c) * -log p(c) */
    for (uint32_t c = 0; c < cls; c++) {
      /* d loss / d logit = p - p_B; times the logit scale */
      lb[c] = (lb[c] - tb[c]) * invB * p->o.logit_scale;
      gB2[c] += lb[c];
    }
    const float *hb = l->h + (size_t)b * hid, *zb = l->z + (size_t)b * hid;
    float *dzb = l->dz + (size_t)b * hid;
    for (uint32_t j = 0; j < hid; j++) {
      float hj = p->s2 * hb[j], dh = 0.0f;
      const float *row = W2 + (size_t)j * cls;
      float *grow = gW2 + (size_t)j * cls;
      for (uint32_t c = 0; c < cls; c++) {
        grow[c] += hj * lb[c];
        dh += row[c] * lb[c];
      }
      dzb[j] = zb[j] > 0.0f ? p->s2 * dh : 0.0f;
      gB1[j] += dzb[j];
    }
    const float *xb = l->x + (size_t)b * in;
    for (uint32_t k = 0; k < in; k++) {
      float xk = p->s1 * xb[k];
      float *grow = gW1 + (size_t)k * hid;
      for (uint32_t j = 0; j < hid; j++)
        grow[j] += xk * dzb[j];
    }
  }
  return loss / B;
}

PROBLEM_SIMD void pulse_sim_learner_adam(pulse_sim_learner *l, float *theta,
                                        const float *grad) {
  const pulse_sim_problem_opts *o = &l->p->o;
  l->t++;
  float b1 = o->beta1, b2 = o->beta2;
  float c1 = 1.0f - (float)pow(b1, (double)l->t),
        c2 = 1.0f - (float)pow(b2, (double)l->t);
  float step = o->lr / c1, rc2 = 1.0f / sqrtf(c2);
  for (uint64_t i = 0; i < l->p->P; i++) {
    float g = grad[i];
    l->m[i] = b1 * l->m[i] + (1.0f - b1) * g;
    l->v[i] = b2 * l->v[i] + (1.0f - b2) * g * g;
    theta[i] -= step * l->m[i] / (sqrtf(l->v[i]) * rc2 + o->eps);
  }
}

double pulse_sim_learner_step(pulse_sim_learner *l, float *theta) {
  double loss = pulse_sim_learner_grad(l, theta, l->grad);
  pulse_sim_learner_adam(l, theta, l->grad);
  return loss;
}
