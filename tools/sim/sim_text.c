/* sim_text.c - next-character prediction on real text (sim_text.h).
 * Built with -O3 like sim_problem.c (tools/CMakeLists.txt): the loops
 * are axpy rows or 8-lane dot products, vectorized without reassociation,
 * and the heavy ones are also built for AVX2 (same bits: -ffp-contract=off
 * forbids fused multiply-adds). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rng_impl.h"
#include "status_impl.h"
#include "sim_mlp_impl.h"
#include "sim_text.h"

#define V 256u /* byte vocabulary */

struct pulse_sim_text {
  pulse_sim_problem_opts o;
  uint8_t *text;
  uint64_t len, digest;
  uint32_t *train; /* positions (of the predicted byte) in training blocks */
  uint64_t ntrain;
  uint32_t *tune; /* text SFT: positions in the fine-tuning blocks */
  uint64_t ntune;
  int phase_tune; /* learners draw from tune (pulse_sim_text_set_phase) */
  uint32_t *test; /* test_count held-out positions */
  /* Text RL: prompts whose rl_length-byte continuation stays in their
   * block, from the fine-tuning part and (test_count) held out. */
  uint32_t *rl_train, *rl_test;
  uint64_t nrl_train;
  uint32_t k, d, H, kd;
  uint64_t P, e, w1, b1, w2, b2; /* offsets in theta */
  float s1, s2;                  /* the forward's multipliers of W1, W2 */
  /* What pulse_sim_text_unfold moved into W1 and W2 (1 before): the
   * random start draws them this much smaller. */
  float fold1, fold2;
};

struct pulse_sim_text_scratch {
  uint32_t rows;             /* capacity */
  const uint8_t **ctx;       /* rows: each row's k context bytes */
  uint8_t *y;                /* rows: the byte each row predicts */
  float *w;                  /* rows: its weight in the loss */
  float *x, *z, *h, *l, *dz; /* rows x kd, H, H, V; H */
  float *dx;                 /* kd */
};

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TEXT_SIMD __attribute__((target_clones("avx2", "default")))
#else
#define TEXT_SIMD
#endif

/* ------------------------------------------------------------------ data */

/* Appends one file to *buf. */
static pulse_status read_file(const char *path, uint8_t **buf, uint64_t *len,
                              uint64_t *cap) {
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return pulse_fail(errno == ENOENT ? PULSE_ERR_NOT_FOUND : PULSE_ERR_IO,
                      "text problem: cannot read %s: %s (the default text "
                      "is base-files' licences in " PULSE_SIM_TEXT_DIR ")",
                      path, strerror(errno));
  for (;;) {
    if (*cap - *len < 65536) {
      uint64_t ncap = *cap * 2 + 65536;
      uint8_t *nb = realloc(*buf, (size_t)ncap);
      if (nb == NULL) {
        fclose(f);
        return pulse_fail(PULSE_ERR_NOMEM, "text problem: %s", path);
      }
      *buf = nb, *cap = ncap;
    }
    size_t got = fread(*buf + *len, 1, (size_t)(*cap - *len), f);
    *len += got;
    if (got == 0)
      break;
  }
  int bad = ferror(f);
  fclose(f);
  if (bad)
    return pulse_fail(PULSE_ERR_IO, "text problem: error reading %s", path);
  return PULSE_OK;
}

static pulse_status load_text(pulse_sim_text *t) {
  static const char *const files[] = {PULSE_SIM_TEXT_FILES};
  uint64_t cap = 0;
  pulse_status st = PULSE_OK;
  if (t->o.text_path != NULL) {
    st = read_file(t->o.text_path, &t->text, &t->len, &cap);
  } else {
    for (size_t i = 0; i < sizeof files / sizeof files[0] && st == PULSE_OK;
         i++) {
      char path[256];
      snprintf(path, sizeof path, "%s%s", PULSE_SIM_TEXT_DIR, files[i]);
      st = read_file(path, &t->text, &t->len, &cap);
    }
  }
  if (st != PULSE_OK)
    return st;
  /* Two blocks at least: one to learn from, one held out. */
  if (t->len < 2u * PULSE_SIM_TEXT_BLOCK || t->len > UINT32_MAX)
    return pulse_fail(PULSE_ERR_ARG,
                      "text problem: %llu bytes of text; needs %u to 2^32",
                      (unsigned long long)t->len, 2u * PULSE_SIM_TEXT_BLOCK);
  uint64_t h = 0x7E47ull;
  for (uint64_t i = 0; i < t->len; i++)
    h = pulse_digest_lane_a(h ^ t->text[i]);
  t->digest = h;
  return PULSE_OK;
}

/* Block b is held out: a tenth of the blocks, chosen by the seed; block 1
 * and block 0 settle the case where the draw left a side empty. */
static int held_out(const pulse_sim_text *t, uint64_t b, uint64_t nblocks,
                    int any_test, int any_train) {
  if (!any_test && b == nblocks - 1)
    return 1;
  if (!any_train && b == nblocks - 1)
    return 0;
  return pulse_rng_at(t->o.seed ^ 0x5B117ull, b) % 10u == 0;
}

static pulse_status split(pulse_sim_text *t) {
  uint64_t nblocks = (t->len + PULSE_SIM_TEXT_BLOCK - 1) / PULSE_SIM_TEXT_BLOCK;
  uint32_t *test_pos = malloc((size_t)t->len * sizeof *test_pos);
  t->train = malloc((size_t)t->len * sizeof *t->train);
  t->tune = malloc((size_t)t->len * sizeof *t->tune);
  t->test = malloc((size_t)t->o.test_count * sizeof *t->test);
  /* Text RL fine-tunes the same checkpoint: the same split. */
  int sft = pulse_sim_problem_is_pretrained(t->o.kind);
  int rl = t->o.kind == PULSE_SIM_PROBLEM_TEXT_RL;
  uint32_t *rl_pool = rl ? malloc((size_t)t->len * sizeof *rl_pool) : NULL;
  if (rl) {
    t->rl_train = malloc((size_t)t->len * sizeof *t->rl_train);
    t->rl_test = malloc((size_t)t->o.test_count * sizeof *t->rl_test);
  }
  if (!test_pos || !t->train || !t->tune || !t->test ||
      (rl && (!rl_pool || !t->rl_train || !t->rl_test))) {
    free(test_pos), free(rl_pool);
    return pulse_fail(PULSE_ERR_NOMEM, "text problem: split");
  }
  uint64_t npool = 0;
  uint64_t ntest = 0;
  for (uint64_t b = 0; b < nblocks; b++) {
    int out = held_out(t, b, nblocks, ntest > 0, t->ntrain > 0);
    /* Text SFT: a third of the others is left for fine-tuning (the last
     * block when the draw left none). */
    int tune = sft && !out &&
               (pulse_rng_at(t->o.seed ^ 0x5F75ull, b) % 3u == 0 ||
                (t->ntune == 0 && b + 2 >= nblocks));
    uint64_t end = (b + 1) * PULSE_SIM_TEXT_BLOCK;
    if (end > t->len)
      end = t->len;
    /* A position predicts text[i] from the k bytes before it. */
    for (uint64_t i = b * PULSE_SIM_TEXT_BLOCK; i < end; i++) {
      if (i < t->k)
        continue;
      /* An RL prompt's continuation text[i .. i + length) is its block's. */
      if (rl && i + t->o.rl_length <= end) {
        if (out)
          rl_pool[npool++] = (uint32_t)i;
        else if (tune)
          t->rl_train[t->nrl_train++] = (uint32_t)i;
      }
      if (out)
        test_pos[ntest++] = (uint32_t)i;
      else if (tune)
        t->tune[t->ntune++] = (uint32_t)i;
      else
        t->train[t->ntrain++] = (uint32_t)i;
    }
  }
  if (ntest == 0 || t->ntrain == 0 || (sft && t->ntune == 0) ||
      (rl && (npool == 0 || t->nrl_train == 0))) {
    free(test_pos), free(rl_pool);
    return pulse_fail(PULSE_ERR_ARG, "text problem: text too short to split");
  }
  uint64_t s = t->o.seed ^ 0x7E57ull;
  for (uint32_t i = 0; i < t->o.test_count; i++)
    t->test[i] = test_pos[pulse_rng_below(&s, ntest)];
  uint64_t r = t->o.seed ^ 0x7E57D1ull;
  for (uint32_t i = 0; rl && i < t->o.test_count; i++)
    t->rl_test[i] = rl_pool[pulse_rng_below(&r, npool)];
  free(test_pos), free(rl_pool);
  return PULSE_OK;
}

void pulse_sim_text_set_phase(pulse_sim_text *t, int tune) {
  t->phase_tune = tune && t->ntune > 0;
}

/* ---------------------------------------------------------------- model */

uint32_t pulse_sim_text_hidden_for(const pulse_sim_problem_opts *o,
                                  uint64_t params) {
  uint64_t fixed = (uint64_t)V * o->embed + V;
  uint64_t per = (uint64_t)o->context * o->embed + 1u + V;
  uint64_t h = params > fixed ? (params - fixed + per - 1) / per : 1;
  return h < 1 ? 1u : h > 1u << 20 ? 1u << 20 : (uint32_t)h;
}

pulse_status pulse_sim_text_create(const pulse_sim_problem_opts *o,
                                  pulse_sim_text **out) {
  *out = NULL;
  if (o->context == 0 || o->context > 64 || o->embed == 0 || o->embed > 1024 ||
      o->hidden > 1u << 20)
    return pulse_fail(PULSE_ERR_ARG,
                      "text problem: context 1..64, embed 1..1024, hidden "
                      "up to 2^20");
  if (o->kind == PULSE_SIM_PROBLEM_TEXT_RL &&
      (o->rl_length == 0 || o->rl_length > 64 || o->rl_group < 2 ||
       o->rl_group > o->batch))
    return pulse_fail(PULSE_ERR_ARG,
                      "text RL: continuations of 1..64 bytes, groups of 2 "
                      "to batch (%u) samples",
                      o->batch);
  pulse_sim_text *t = calloc(1, sizeof *t);
  if (t == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "text problem");
  t->o = *o;
  t->k = o->context, t->d = o->embed, t->H = o->hidden;
  t->kd = t->k * t->d;
  t->e = 0;
  t->w1 = (uint64_t)V * t->d;
  t->b1 = t->w1 + (uint64_t)t->kd * t->H;
  t->w2 = t->b1 + t->H;
  t->b2 = t->w2 + (uint64_t)t->H * V;
  t->P = t->b2 + V;
  t->s1 = 1.0f / sqrtf((float)t->kd);
  t->s2 = 1.0f / sqrtf((float)t->H);
  t->fold1 = t->fold2 = 1.0f;
  pulse_status st = load_text(t);
  if (st == PULSE_OK)
    st = split(t);
  if (st != PULSE_OK) {
    pulse_sim_text_free(t);
    return st;
  }
  *out = t;
  return PULSE_OK;
}

void pulse_sim_text_free(pulse_sim_text *t) {
  if (t == NULL)
    return;
  free(t->text), free(t->train), free(t->tune), free(t->test);
  free(t->rl_train), free(t->rl_test);
  free(t);
}

uint64_t pulse_sim_text_param_count(const pulse_sim_text *t) {
  return t->P;
}

const pulse_sim_problem_opts *pulse_sim_text_opts(const pulse_sim_text *t) {
  return &t->o;
}

uint32_t pulse_sim_text_context(const pulse_sim_text *t) {
  return t->k;
}

const uint8_t *pulse_sim_text_data(const pulse_sim_text *t) {
  return t->text;
}

const uint32_t *pulse_sim_text_rl_prompts(const pulse_sim_text *t,
                                         int held_out, uint64_t *n) {
  *n = t->rl_train == NULL ? 0 : held_out ? t->o.test_count : t->nrl_train;
  return held_out ? t->rl_test : t->rl_train;
}

uint64_t pulse_sim_text_bytes(const pulse_sim_text *t) {
  return t->len;
}

uint64_t pulse_sim_text_digest(const pulse_sim_text *t) {
  return t->digest;
}

/* W1 *= a, W2 *= b (no copy when 1: the scaled start keeps its bits). */
static void scale_weights(const pulse_sim_text *t, float *theta, float a,
                          float b) {
  for (uint64_t i = t->w1; a != 1.0f && i < t->b1; i++)
    theta[i] *= a;
  for (uint64_t i = t->w2; b != 1.0f && i < t->b2; i++)
    theta[i] *= b;
}

void pulse_sim_text_init(const pulse_sim_text *t, float *theta) {
  uint64_t s = t->o.seed ^ 0x7E47141ull;
  pulse_sim_normals(&s, theta + t->e, t->b1 - t->e);        /* E, W1 */
  pulse_sim_normals(&s, theta + t->w2, (uint64_t)t->H * V); /* W2 */
  for (uint64_t i = 0; i < t->P; i++)
    theta[i] *= t->o.init_scale;
  memset(theta + t->b1, 0, t->H * sizeof *theta);
  memset(theta + t->b2, 0, V * sizeof *theta);
  scale_weights(t, theta, t->fold1, t->fold2);
}

void pulse_sim_text_unfold(pulse_sim_text *t, float *theta) {
  if (t->fold1 != 1.0f || t->fold2 != 1.0f)
    return; /* once */
  t->fold1 = t->s1, t->fold2 = t->s2;
  if (theta != NULL)
    scale_weights(t, theta, t->s1, t->s2);
  t->s1 = t->s2 = 1.0f;
}

/* Sum of a[i] b[i] in 8 fixed lanes, added in a fixed tree: the same bits
 * in any vector width. */
static inline float dot8(const float *a, const float *b, uint32_t n) {
  float acc[8] = {0};
  uint32_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int q = 0; q < 8; q++)
      acc[q] += a[i + q] * b[i + q];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) +
            ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; i++)
    s += a[i] * b[i];
  return s;
}

/* Forward of n rows, row b predicting from the k bytes at ctx[b]: x
 * (n x kd), z and h (n x H), logits (n x V). */
TEXT_SIMD static void forward(const pulse_sim_text *t, const float *theta,
                              const uint8_t *const *ctx, size_t n, float *x,
                              float *z, float *h, float *logits) {
  uint32_t d = t->d, H = t->H, kd = t->kd;
  const float *E = theta + t->e, *W1 = theta + t->w1, *B1 = theta + t->b1,
              *W2 = theta + t->w2, *B2 = theta + t->b2;
  for (size_t b = 0; b < n; b++) {
    float *xb = x + b * kd;
    for (uint32_t c = 0; c < t->k; c++)
      memcpy(xb + c * d, E + (size_t)ctx[b][c] * d, d * sizeof *xb);
    pulse_sim_mlp_forward_row(xb, kd, t->s1, W1, B1, H, t->s2, W2, B2, V, z + b * H,
                             h + b * H, logits + b * V);
  }
}

/* -log softmax(l)[y] in double; turns l into the probabilities when
 * probs is set. */
static double xent(float *l, uint32_t y, int probs, uint32_t *argmax) {
  float mx = l[0];
  uint32_t am = 0;
  for (uint32_t c = 1; c < V; c++)
    if (l[c] > mx)
      mx = l[c], am = c;
  double sum = 0.0;
  for (uint32_t c = 0; c < V; c++)
    sum += exp((double)(l[c] - mx));
  double loss = log(sum) - (double)(l[y] - mx);
  if (probs)
    for (uint32_t c = 0; c < V; c++)
      l[c] = (float)(exp((double)(l[c] - mx)) / sum);
  if (argmax)
    *argmax = am;
  return loss;
}

void pulse_sim_text_eval(const pulse_sim_text *t, const float *theta,
                        double *loss, double *accuracy) {
  enum { BLOCK = 32 };
  uint32_t H = t->H, kd = t->kd;
  float *x = malloc((size_t)BLOCK * kd * sizeof *x),
        *z = malloc((size_t)BLOCK * H * sizeof *z),
        *h = malloc((size_t)BLOCK * H * sizeof *h),
        *l = malloc((size_t)BLOCK * V * sizeof *l);
  const uint8_t *ctx[BLOCK];
  double total = 0.0;
  uint64_t right = 0;
  uint32_t T = t->o.test_count;
  if (x && z && h && l) {
    for (uint32_t a = 0; a < T; a += BLOCK) {
      size_t n = T - a < BLOCK ? T - a : BLOCK;
      for (size_t b = 0; b < n; b++)
        ctx[b] = t->text + t->test[a + b] - t->k;
      forward(t, theta, ctx, n, x, z, h, l);
      for (size_t b = 0; b < n; b++) {
        uint32_t y = t->text[t->test[a + b]], am;
        total += xent(l + b * V, y, 0, &am);
        right += am == y;
      }
    }
  } else {
    total = NAN;
  }
  free(x), free(z), free(h), free(l);
  if (loss)
    *loss = total / T;
  if (accuracy)
    *accuracy = (double)right / T;
}

/* -------------------------------------------------------------- learner */

pulse_status pulse_sim_text_scratch_create(const pulse_sim_text *t,
                                          uint32_t rows,
                                          pulse_sim_text_scratch **out) {
  pulse_sim_text_scratch *s = calloc(1, sizeof *s);
  size_t R = rows;
  if (s != NULL) {
    s->rows = rows;
    s->ctx = malloc(R * sizeof *s->ctx);
    s->y = malloc(R);
    s->w = malloc(R * sizeof *s->w);
    s->x = malloc(R * t->kd * sizeof *s->x);
    s->z = malloc(R * t->H * sizeof *s->z);
    s->h = malloc(R * t->H * sizeof *s->h);
    s->dz = malloc(t->H * sizeof *s->dz);
    s->l = malloc(R * V * sizeof *s->l);
    s->dx = malloc(t->kd * sizeof *s->dx);
  }
  if (s == NULL || rows == 0 || !s->ctx || !s->y || !s->w || !s->x || !s->z ||
      !s->h || !s->dz || !s->l || !s->dx) {
    pulse_sim_text_scratch_free(s);
    return pulse_fail(PULSE_ERR_NOMEM, "text problem: learner buffers");
  }
  *out = s;
  return PULSE_OK;
}

void pulse_sim_text_scratch_free(pulse_sim_text_scratch *s) {
  if (s == NULL)
    return;
  free(s->ctx), free(s->y), free(s->w);
  free(s->x), free(s->z), free(s->h), free(s->dz), free(s->l), free(s->dx);
  free(s);
}

float *pulse_sim_text_forward(const pulse_sim_text *t,
                              pulse_sim_text_scratch *s, const float *theta,
                              const uint8_t *const *ctx, uint32_t first,
                              uint32_t n) {
  forward(t, theta, ctx, n, s->x + (size_t)first * t->kd,
          s->z + (size_t)first * t->H, s->h + (size_t)first * t->H,
          s->l + (size_t)first * V);
  return s->l + (size_t)first * V;
}

TEXT_SIMD double pulse_sim_text_backward(const pulse_sim_text *t,
                                        pulse_sim_text_scratch *s,
                                        const float *theta,
                                        const uint8_t *const *ctx,
                                        const uint8_t *y, const float *w,
                                        uint32_t n, float *grad) {
  uint32_t H = t->H, kd = t->kd, d = t->d;
  float *gE = grad + t->e, *gW1 = grad + t->w1, *gB1 = grad + t->b1,
        *gW2 = grad + t->w2, *gB2 = grad + t->b2;
  const float *W1 = theta + t->w1, *W2 = theta + t->w2;
  double loss = 0.0;
  for (uint32_t b = 0; b < n; b++) {
    if (w[b] == 0.0f) /* adds nothing: skipped */
      continue;
    float *lb = s->l + (size_t)b * V; /* becomes d loss / d logits */
    loss += xent(lb, y[b], 1, NULL);
    lb[y[b]] -= 1.0f;
    for (uint32_t c = 0; c < V; c++) {
      lb[c] *= w[b];
      gB2[c] += lb[c];
    }
    const float *hb = s->h + (size_t)b * H, *xb = s->x + (size_t)b * kd;
    for (uint32_t j = 0; j < H; j++) {
      if (hb[j] == 0.0f) { /* ReLU off: no gradient through j */
        s->dz[j] = 0.0f;
        continue;
      }
      float hj = t->s2 * hb[j];
      float *grow = gW2 + (size_t)j * V;
      for (uint32_t c = 0; c < V; c++)
        grow[c] += hj * lb[c];
      s->dz[j] = t->s2 * dot8(W2 + (size_t)j * V, lb, V);
      gB1[j] += s->dz[j];
    }
    for (uint32_t i = 0; i < kd; i++) {
      float xi = t->s1 * xb[i];
      float *grow = gW1 + (size_t)i * H;
      for (uint32_t j = 0; j < H; j++)
        grow[j] += xi * s->dz[j];
      s->dx[i] = t->s1 * dot8(W1 + (size_t)i * H, s->dz, H);
    }
    for (uint32_t c = 0; c < t->k; c++) {
      float *ge = gE + (size_t)ctx[b][c] * d;
      for (uint32_t i = 0; i < d; i++)
        ge[i] += s->dx[c * d + i];
    }
  }
  return loss;
}

double pulse_sim_text_grad(const pulse_sim_text *t, pulse_sim_text_scratch *s,
                          uint64_t *rng, const float *theta, float *grad) {
  uint32_t B = t->o.batch;
  const uint32_t *from = t->phase_tune ? t->tune : t->train;
  uint64_t n = t->phase_tune ? t->ntune : t->ntrain;
  float invB = 1.0f / (float)B;
  for (uint32_t b = 0; b < B; b++) {
    uint32_t pos = from[pulse_rng_below(rng, n)];
    s->ctx[b] = t->text + pos - t->k;
    s->y[b] = t->text[pos];
    s->w[b] = invB;
  }
  pulse_sim_text_forward(t, s, theta, s->ctx, 0, B);
  memset(grad, 0, (size_t)t->P * sizeof *grad);
  return pulse_sim_text_backward(t, s, theta, s->ctx, s->y, s->w, B, grad) /
         B;
}
